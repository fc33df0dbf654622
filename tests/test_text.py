"""What the node logs and journals of what a client sent: one printable line of bounded length."""

import errno

from provided_code.apps.node.text import ERROR_LIMIT, duration, one_line, printable
from provided_code.errors import UserError


def test_control_characters_become_question_marks():
    assert printable("AB\x1b[31mC\x1b[0m\n") == "AB?[31mC?[0m"


def test_long_tag_text_is_cut_to_its_limit():
    assert printable("9" * 100) == "9" * 61 + "..."
    assert printable(None) == ""


def test_an_error_is_its_first_line_only():
    error = RuntimeError("the disk is full\nTraceback (most recent call last):\n  File \"x.py\", line 1")
    assert one_line(error) == "RuntimeError: the disk is full"


def test_an_os_error_names_its_file_not_the_whole_path():
    error = OSError(errno.ENOSPC, "No space left on device", "/var/lib/node/" + "1.2" * 60 + "/x.dcm")
    assert one_line(error) == "[Errno 28] No space left on device: x.dcm"


def test_a_long_message_is_cut_to_the_limit():
    assert len(one_line(UserError("x" * 2000))) == ERROR_LIMIT


def test_paths_in_the_store_are_named_from_it(tmp_path):
    error = UserError(f"{tmp_path / 'objects' / '1.2' / '1.3.dcm'}: contours are in another frame")
    assert one_line(error, within=tmp_path) == "objects/1.2/1.3.dcm: contours are in another frame"


def test_a_delay_is_said_as_a_person_says_it():
    """A retry's delay in the log: minutes and seconds, not a fraction of a minute ("1.33333 min")."""
    said = {seconds: duration(seconds) for seconds in (0.05, 2.5, 12.3, 80, 80.0000004, 300, 5400, 17280, 86400)}
    assert said == {0.05: "0.05 s", 2.5: "2.5 s", 12.3: "12 s", 80: "1 min 20 s", 80.0000004: "1 min 20 s",
                    300: "5 min", 5400: "1 h 30 min", 17280: "4 h 48 min", 86400: "24 h"}
