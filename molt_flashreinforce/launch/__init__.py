"""The Molt launcher: a composed config checked, rendered into Molt's own flags, validated by Molt's
parser, recorded, and run under the supervisor (`job.launch`). The command line is `app/`."""
