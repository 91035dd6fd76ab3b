"""libpsclient's options, read from the library's own table: the keywords
of psd.Client, psworker's flags and the documents all follow it."""

import collections

from ._lib import lib


# One of libpsclient's options: name (the keyword of Client), flag
# (psworker's, without "--"; None: none), arg (the value's form), values
# (what a value may be), default and help, as the library's table holds them.
Option = collections.namedtuple("Option", ("name", "flag", "arg", "values", "default", "help"))


def _read_options():
    out = []
    i = 0
    while True:
        p = lib.psc_option(i)
        if not p:
            return tuple(out)
        o = p.contents
        out.append(Option(*(None if v is None else v.decode() for v in
                            (o.name, o.flag, o.arg, o.values, o.dflt, o.help))))
        i += 1


_OPTION_LIST = _read_options()
# the keyword arguments of Client: the library's options, from its own table
_OPTIONS = tuple(o.name for o in _OPTION_LIST)


def options():
    """libpsclient's options, in its table's order: Option tuples (name,
    flag, arg, values, default, help). Client takes each name as a keyword
    argument; a bool is sent as "on" or "off"."""
    return _OPTION_LIST


def _opt_text(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
