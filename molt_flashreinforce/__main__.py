"""`python -m molt_flashreinforce`: the same Hydra app as the `molt-flashreinforce` command."""

from molt_flashreinforce.app.shell import main

if __name__ == "__main__":
    main()
