"""streams component."""
