"""How a job command fails: its exit codes, and the error whose message it prints as one line."""

EXIT_OK = 0
EXIT_FAILED = 1  # the job failed to start, or an operation on it failed
EXIT_USAGE = 2  # invalid arguments or node config
EXIT_NOT_FOUND = 3  # no such job on this node


class JobError(Exception):
    """A problem the caller can act on; the message is printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
