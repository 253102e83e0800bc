"""Where one attempt begins in the job log. A job's attempts share one log file (and so one CloudWatch
stream): the supervisor starts each attempt's part with a marker line, and `status` reads the last step,
the resume point and NCCL's network from the part of the current attempt only, so a new attempt never
reports what the previous one logged."""

import re
from typing import Optional

LOG_PREFIX = "[node_bootstrap.jobs]"  # the supervisor's own lines in the job log
# At the start of a line: torchrun's workers' output cannot put it there under a "[rankN]:" prefix, and the
# supervisor writes it before torchrun starts.
_MARKER_RE = re.compile(r"^\[node_bootstrap\.jobs\] \S+ attempt ([0-9]+) starts on [^\n]*\n", re.MULTILINE)


def attempt_marker(attempt: int, when: str, hostname: str, argv: list[str]) -> str:
    """The line the supervisor writes before it starts torchrun: `[node_bootstrap.jobs] <UTC time> attempt
    <N> starts on <host>: <torchrun argv>`."""
    return f"{LOG_PREFIX} {when} attempt {attempt} starts on {hostname}: {' '.join(argv)}\n"


def _last_marker(text: str) -> Optional["re.Match[str]"]:
    matches = list(_MARKER_RE.finditer(text))  # a handful: one per attempt the text spans
    return matches[-1] if matches else None


def attempt_part(head: str, tail: str, attempt: int) -> tuple[str, str]:
    """The (head, tail) of a job log (control.read_log_ends) cut down to what `attempt` logged:
    - the tail's newest marker is this attempt's: the tail after it (the head is older);
    - it is another attempt's (this one has not logged yet, or its supervisor never started): nothing;
    - the tail has no marker (this attempt logged more than the tail holds, or the log predates markers): the
      whole tail, and of the head what follows its newest marker when that is this attempt's, all of it when
      it has none, nothing when it is another attempt's."""
    marker = _last_marker(tail)
    if marker is not None:
        return ("", tail[marker.end():]) if int(marker.group(1)) == attempt else ("", "")
    marker = _last_marker(head)
    if marker is None:
        return head, tail
    return (head[marker.end():], tail) if int(marker.group(1)) == attempt else ("", tail)
