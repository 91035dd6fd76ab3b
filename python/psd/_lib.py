"""Loads libpsclient and declares its functions for ctypes.

Where from, in order: $PSD_CLIENT_LIBRARY (the build tree's tests set it),
the path an installation recorded in _installed.py, the dynamic linker's
own search ("libpsclient.so.1": /usr/lib, ldconfig, LD_LIBRARY_PATH), and
last, for a package used from the source tree, build/client/ beside it.
"""

import ctypes
import os

_SONAME = "libpsclient.so.1"


def _candidates():
    env = os.environ.get("PSD_CLIENT_LIBRARY")
    if env:
        yield env
        return
    try:
        from ._installed import LIBRARY  # written by cmake --install
        yield LIBRARY
    except ImportError:
        pass
    yield _SONAME
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "client", _SONAME)


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("psd: cannot load libpsclient (%s); build it (scripts/setup.sh) and set "
                      "PSD_CLIENT_LIBRARY to build/client/%s, or install it (cmake --install)"
                      % ("; ".join(errors), _SONAME))


lib = _load()

_c = ctypes.c_void_p
_i = ctypes.c_int
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_s = ctypes.c_char_p
_f = ctypes.POINTER(ctypes.c_float)
_d = ctypes.c_double


class OptionInfo(ctypes.Structure):
    """psc_option_info: one row of libpsclient's table of options."""
    _fields_ = [("name", _s), ("flag", _s), ("arg", _s), ("values", _s), ("dflt", _s), ("help", _s)]


for name, res, args in [
    ("psc_version_string", _s, []),
    ("psc_strerror", _s, [_i]),
    ("psc_new", _c, []),
    ("psc_set", _i, [_c, _s, _s]),
    ("psc_option", ctypes.POINTER(OptionInfo), [ctypes.c_uint]),
    ("psc_add_tensor", _i, [_c, _s, _u32, ctypes.POINTER(_u64)]),
    ("psc_add_buffer", _i, [_c, _s, _u32, ctypes.POINTER(_u64), _s, _s]),
    ("psc_size", _u64, [_c]),
    ("psc_tensor_count", _u32, [_c]),
    ("psc_tensor_info", _i, [_c, _u32, ctypes.POINTER(_s), ctypes.POINTER(_u32), ctypes.POINTER(_u64),
                             ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    ("psc_params", _c, [_c]),
    ("psc_grads", _c, [_c]),
    ("psc_bind", _i, [_c, _c, _c]),
    ("psc_connect", _i, [_c]),
    ("psc_close", None, [_c]),
    ("psc_leave", None, [_c, _s]),
    ("psc_free", None, [_c]),
    ("psc_pushpull", _i, [_c]),
    ("psc_push", _i, [_c]),
    ("psc_pull", _i, [_c]),
    ("psc_push_range", _i, [_c, _u64, _u64]),
    ("psc_pull_range", _i, [_c, _u64, _u64]),
    ("psc_push_tensor", _i, [_c, _s]),
    ("psc_pull_tensor", _i, [_c, _s]),
    ("psc_set_base", _i, [_c, _u64]),
    ("psc_pushpull_start", _i, [_c]),
    ("psc_wait", _i, [_c]),
    ("psc_poll", _i, [_c]),
    ("psc_report", _i, [_c, _u32, _d, _d, _d, _u64, _d]),
    ("psc_progress", _i, [_c, _u32, _d, _u64]),
    ("psc_live_shards", _i, [_c, ctypes.POINTER(_u32), ctypes.POINTER(_u32)]),
    ("psc_plan_set", _i, [_c, _u64, _u64, _u64, _u64]),
    ("psc_plan", _i, [_c] + [ctypes.POINTER(_u64)] * 4),
    ("psc_plan_slice", _i, [_c] + [ctypes.POINTER(_u64)] * 3 + [ctypes.POINTER(_u32)] * 2),
    ("psc_plan_done", _i, [_c]),
    ("psc_waiting_for", ctypes.c_size_t, [_c, ctypes.c_void_p, ctypes.c_size_t]),
    ("psc_reconnect", _i, [_c]),
    ("psc_table", _i, [_c, _s, _u32, _s, _d, _u64, _s, _s]),
    ("psc_table_pull", _i, [_c, _s, _c, ctypes.c_size_t, _c]),
    ("psc_table_push", _i, [_c, _s, _c, ctypes.c_size_t, _c]),
    ("psc_table_pushpull", _i, [_c, _s, _c, ctypes.c_size_t, _c, _c, ctypes.c_size_t, _c]),
    ("psc_mode", _s, [_c]),
    ("psc_model_version", _u64, [_c]),
    ("psc_shard", None, [_c, ctypes.POINTER(_u32), ctypes.POINTER(_u32)]),
    ("psc_servers", _u32, [_c]),
    ("psc_wire", _s, [_c]),
    ("psc_shm", _i, [_c]),
    ("psc_table_shm", _i, [_c]),
    ("psc_hogwild", _i, [_c]),
    ("psc_hogwild_params", _c, [_c]),
    ("psc_reconnects", _u64, [_c]),
    ("psc_lag", ctypes.c_int64, [_c]),
    ("psc_lost_steps", _u64, [_c]),
    ("psc_dropped", _u64, [_c]),
    ("psc_local_steps", _u32, [_c]),
    ("psc_elastic", _i, [_c, ctypes.POINTER(_d), ctypes.POINTER(_u32)]),
    ("psc_local_step", _i, [_c]),
    ("psc_errmsg", _s, [_c]),
]:
    fn = getattr(lib, name)
    fn.restype = res
    fn.argtypes = args

# the codes of include/psd/client.h, by value
PSC_CODES = {
    -1: "EMALFORMED", -2: "ETOO_BIG", -3: "EUNSUPPORTED", -4: "EBAD_TYPE", -5: "EBAD_FIELD", -6: "ESTATE",
    -7: "ELAYOUT", -8: "ERANGE", -9: "ENONFINITE", -10: "ESTALE", -11: "EDUPLICATE", -12: "ESHARD",
    -13: "ENOT_READY", -14: "EAUTH", -15: "EFORBIDDEN", -16: "ELIMIT", -17: "ESHUTDOWN", -18: "ENOMEM",
    -19: "EIO", -20: "ECONNECT", -21: "ETIMEOUT", -22: "ECLOSED", -23: "EINVAL", -24: "EREMOTE", -25: "EBUSY",
    -26: "ENOTFOUND", -27: "EINTR",
}
