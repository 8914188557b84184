"""`python -m choreography_ray.cli`, as the `choreography` command."""

from . import main

main()
