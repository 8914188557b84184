"""The Ray shell: host actors, activation and routing, the Jobs client, membership."""
