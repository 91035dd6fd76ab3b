"""psd's errors: PsdError, which every failed libpsclient call raises, and
the names and texts of the library's error codes."""

from ._lib import lib, PSC_CODES

_EINTR = -27  # PSC_EINTR: a wait ended by a signal


def strerror(code):
    """A short description of a libpsclient error code."""
    return lib.psc_strerror(int(code)).decode()


def error_name(code):
    """The symbolic name of a libpsclient error code ("ELAYOUT"), or "E?"."""
    return PSC_CODES.get(-abs(int(code)), "E?")


class PsdError(Exception):
    """A libpsclient call failed: .code (negative), .name ("ELAYOUT", ...)
    and the library's one-line message."""

    def __init__(self, code, message):
        self.code = code
        self.name = error_name(code)
        super().__init__("%s [%s]" % (message, self.name))

