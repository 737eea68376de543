"""The `ppd` commands, one module each: ``register(commands)`` adds its sub-parser, ``run(args)`` runs it (its exit
code). ``options``, ``loading`` and ``serving`` hold what several share."""
