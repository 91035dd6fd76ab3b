"""test_options.py - one table of client options, and everything that follows it.

libpsclient holds its options in one table (psc_option); psc_set reads it,
the Python package takes its keyword arguments from it and psworker its
flags and their help. These tests walk the table and check each side, so a
new option that one side does not take, or a document that does not list
it, fails here:

- psd.Client takes every option as a keyword (with a value the library
  accepts: its default), refuses a bad value with the library's message, and
  an unknown keyword with the whole list;
- psworker has a flag for every option that has one, lists it in --help with
  its psc_set key, and refuses a bad value with exit status 2 and one line;
- docs/client.md's options table and include/psd/client.h's psc_set comment
  name exactly the table's options.

Run by ctest (client_options):

    PSD_CLIENT_LIBRARY=build/client/libpsclient.so.1 PYTHONPATH=python PSWORKER_BIN=build/worker/psworker \\
        /usr/bin/python3 -m pytest -q tests/client/test_options.py
"""

import os
import re
import subprocess

import pytest

import psd

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BAD = "bogus!value"


def bad_value(name):
    """A value psc_set refuses: server is resolved at connect, so only an
    empty one is refused at once."""
    return "" if name == "server" else BAD


def options():
    opts = psd.options()
    assert len(opts) >= 10, opts
    return opts


def good_value(o):
    """A value the library takes for option o: its default, or the literal
    after "else" when the default names an environment variable first."""
    d = o.default
    if "$" not in d:
        return d
    return d.split(", else ", 1)[1] if ", else " in d else ""


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


@pytest.mark.parametrize("name", [o.name for o in psd.options()])
def test_python_takes_every_option(name):
    o = {x.name: x for x in options()}[name]
    c = psd.Client([("w", (4,))], **{name: good_value(o)})
    c.close()
    with pytest.raises(psd.PsdError) as e:
        psd.Client([("w", (4,))], **{name: bad_value(name)})
    assert e.value.name == "EINVAL"
    assert "'%s'" % bad_value(name) in str(e.value) or name == "token_file", str(e.value)


def test_python_unknown_keyword_lists_the_table():
    with pytest.raises(TypeError) as e:
        psd.Client([("w", (4,))], no_such_option=1)
    for o in options():
        assert o.name in str(e.value)


def test_every_row_is_complete():
    names = [o.name for o in options()]
    assert len(set(names)) == len(names), names
    flags = [o.flag for o in options() if o.flag]
    assert len(set(flags)) == len(flags), flags
    for o in options():
        for field in ("name", "arg", "values", "default", "help"):
            assert getattr(o, field), "option %s has no %s" % (o.name, field)


def psworker(*args):
    return subprocess.run([os.environ["PSWORKER_BIN"]] + list(args), capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PSD_DATA_DIR=os.path.join(ROOT, "data")))


def test_psworker_help_lists_every_flag():
    r = psworker("--help")
    assert r.returncode == 0, r.stderr
    for o in options():
        if o.flag:
            assert re.search(r"--%s %s\b" % (re.escape(o.flag), re.escape(o.arg.split("|")[0])), r.stdout), \
                "psworker --help lacks --%s %s" % (o.flag, o.arg)
            assert "[%s]" % o.name in r.stdout, "psworker --help does not name option %s" % o.name


@pytest.mark.parametrize("name", [o.name for o in psd.options() if o.flag])
def test_psworker_flag_refuses_a_bad_value(name):
    o = {x.name: x for x in options()}[name]
    r = psworker("--%s" % o.flag, bad_value(name), "--epochs", "1")
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert bad_value(name) in err, err
    if not o.name.startswith("token"):
        assert "--%s" % o.flag in err, err


def test_client_md_and_header_list_every_option():
    md = read("docs", "client.md")
    section = re.search(r"^## Options.*?\n(.*?)^## ", md, re.S | re.M)
    assert section, "docs/client.md has no Options section"
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", section.group(1), re.M)
    assert sorted(documented) == sorted(o.name for o in options()), \
        "docs/client.md's options table and libpsclient's table differ"
    header = read("include", "psd", "client.h")
    comment = re.search(r"/\* Sets one option.*?\*/", header, re.S)
    assert comment
    listed = re.findall(r"^ \*   ([a-z_0-9]+) ", comment.group(0), re.M)
    assert sorted(listed) == sorted(o.name for o in options()), \
        "include/psd/client.h's psc_set comment and libpsclient's table differ"
