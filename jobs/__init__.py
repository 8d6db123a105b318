"""Long-running jobs behind `counter replay|recount|audit|dlq`: plain classes and functions, no console.

Each job takes typed options (a dataclass), the stores and clients it needs, a `Progress` (how far it is,
what it wants the user to know) and a stop signal (`() -> bool`, checked between units of work): a stopped
job saves its state and returns, and the same job run again resumes. The CLI (`counter_cli`) parses the
arguments, implements `Progress` with rich and prints the results; nothing here prints.

Layering: `jobs` sits above the pipeline's building blocks (`agents.persist`, `agents.persist_path`,
`agents.rollup`, `agents.watermark`, `agents.metrics`, `agents.windows`) and never imports the worker that
hosts them (`agents.worker`, `agents.persist_consumer`, `agents.__main__`); only `counter_cli` imports
`jobs`. The contracts are in pyproject.toml ([tool.importlinter]).
"""
