"""The `counter` command line: the composition root that starts and wires the components."""
