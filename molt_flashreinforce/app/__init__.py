"""The `molt-flashreinforce` command: `shell` (the command line, Hydra, one-line refusals and exit
statuses) over `dispatch` (which backend runs a composed config). The top of the package: nothing
imports it."""
