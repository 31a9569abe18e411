"""`python -m molt_flashreinforce`: the same Hydra app as the `molt-flashreinforce` command."""

from molt_flashreinforce.launch.app import main

if __name__ == "__main__":
    main()
