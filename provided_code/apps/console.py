"""What every command line shares (``openkbp-train``, ``openkbp-score``, ``openkbp-dicom``, the demo):
logging set up before TensorFlow loads, the progress bar, a user error shown as one line, and the
``--epoch`` value. The command lines are the only modules that print; the library logs."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Iterable, Iterator, TypeVar

import click

from provided_code.errors import UserError
from provided_code.infra.environment import configure_tensorflow

T = TypeVar("T")

# Bad input or settings, and a file the run cannot read or write: shown as one line, not a traceback.
USER_ERRORS = (UserError, OSError)


def setup_logging() -> None:
    """Log lines on stderr; first, TensorFlow's process settings (before anything imports it)."""
    configure_tensorflow()  # oneDNN CPU kernels, quiet C++ start-up
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-variable all-reduce chatter
    # pydicom logs each warning about the data it reads (an invalid value for a VR) and raises it too
    # (its warn_and_log): the log line says it; the raised copy would say it again, with a file path of
    # the installation. (openkbp-dicom serve quietens pydicom's log as well, unless --verbose.)
    warnings.filterwarnings("ignore", module=r"pydicom(\.|$)")


def click_progress(iterable: Iterable[T], length: int, label: str) -> Iterator[T]:
    """A progress bar on stderr, for the library's ``progress`` hook."""
    with click.progressbar(iterable, length=length, label=label, file=sys.stderr) as bar:
        yield from bar


def one_line(error: Exception) -> str:
    """The message of a user error; for an OSError, the path and the reason."""
    if isinstance(error, OSError) and not isinstance(error, UserError) and error.filename is not None:
        return f"{error.filename}: {error.strerror or error}"
    return str(error)


def parse_epoch(value: str | None, param_hint: str = "--epoch") -> int | str | None:
    """``--epoch`` (or ``param_hint``'s flag): a checkpoint's epoch as an integer, ``"best"``, or None
    when not given; anything else is a usage error."""
    if value is None or value == "best":
        return value
    if not value.isdigit():
        raise click.BadParameter(f"Expected a checkpoint epoch (an integer) or 'best'. Received: {value!r}",
                                 param_hint=param_hint)
    return int(value)
