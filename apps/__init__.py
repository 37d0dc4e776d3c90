"""The `aie-apps` command line: thin commands over pipelines/, one file per command."""
