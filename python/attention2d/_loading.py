"""Why attention2d._core does not load, in words: the system's shared library it needs and does
not find (a wheel built where Open MPI or libgloo was installed, run where it is not), the Debian
package that provides it, and what to do. The loader's own text says only "libmpi.so.40: cannot
open shared object file". _system_libraries.py (written by python/system_libraries.cmake when the
module was built) says which part of the build needs each library and where it came from."""

import re

# The loader's message for a library it cannot load: "libmpi.so.40: cannot open shared object
# file: No such file or directory", or "/lib/x86_64-linux-gnu/libmpi.so.40: file too short".
_LIBRARY_ERROR = re.compile(r"^(?P<path>[^\s:]*?(?P<name>lib[^\s:/]+\.so(?:\.[0-9]+)*)): "
                            r"(?P<reason>.+)$")

# What each optional part of the build is for and the setting that builds without it.
_PARTS = {
    "MPI": ("Open MPI (the MPI transport, for jobs started by mpirun or srun; a torch job does "
            "not use it)", "MPI", "A2D_WITH_MPI"),
    "Gloo": ("Gloo (the watchdog's link and the 'mesh' transport; built without it, a torch job "
             "runs with no watchdog)", "Gloo", "A2D_WITH_GLOO"),
}


def _recorded():
    """(LIBRARIES, BUILT_ON) of the build, or ({}, "") where it recorded nothing."""
    try:
        from . import _system_libraries
    except ImportError:
        return {}, ""
    return _system_libraries.LIBRARIES, _system_libraries.BUILT_ON


def explain(error):
    """An ImportError in words for `error` (the ImportError of `from . import _core`), or None
    where it is not a library that did not load (the caller re-raises the original)."""
    match = _LIBRARY_ERROR.match(str(error).strip())
    if not match:
        return None
    name = match.group("name")
    libraries, built_on = _recorded()
    parts, package = libraries.get(name, ("", ""))
    where = " on the machine that built it (%s)" % built_on if built_on else ""
    lines = ["attention2d's compiled module (attention2d._core) did not load: it needs the "
             "shared library %s, which does not load here (%s)." % (name, error)]
    if package:
        lines.append("%s comes from the Debian package %s%s." % (name, package, where))
    else:
        lines.append("Which package provides %s is not recorded; on Debian and Ubuntu, "
                     "`apt-file search %s` finds it." % (name, name))
    options = [_PARTS[part] for part in parts.split(" and ") if part in _PARTS]
    install = ("install it here (sudo apt-get install %s)" % package if package
               else "install the package that provides it here")
    if name not in libraries:
        lines.append("Install the package that provides it here, or build attention2d on this "
                     "machine from its source (`python -m pip install --force-reinstall "
                     "--no-cache-dir .`: the build leaves out MPI and Gloo where it does not find "
                     "them).")
    elif options:
        lines.append("attention2d was built with %s." % " and ".join(what for what, _, _ in options))
        settings = " ".join("--config-settings=cmake.define.%s=OFF" % setting
                            for _, _, setting in options)
        lines.append("Either %s, or build attention2d without %s: from its source, `python -m pip "
                     "install --force-reinstall --no-cache-dir %s .` (docs/python.md, "
                     "\"Building and installing\")."
                     % (install, " and ".join(short for _, short, _ in options), settings))
    else:
        lines.append("Every build of attention2d needs it: %s." % install)
    explained = ImportError(" ".join(lines), name="attention2d._core",
                            path=getattr(error, "path", None))
    explained.library = name
    explained.package = package
    return explained

