"""Training methods (placeholder until the train/ split lands: the CLI of coda_agent.train_cli)."""
from ..train_cli import add_arguments, main_train  # noqa: F401
