"""Runs one of the package's command-line tools in place of this process (os.execv, so the
caller's pid is the tool's): `python -m mooncake.cli` is mooncake_master, as in upstream's
wheel, whose console scripts are such launchers. `pip install .` puts the tools themselves
into the environment's bin directory; this finds them there (or beside the package)."""
import os
import sys
import sysconfig


def find_tool(name):
    """The path of tool `name`, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def run(name):
    path = find_tool(name)
    if path is None:
        sys.stderr.write(f"{name}: not installed with this mooncake package "
                         f"({os.path.dirname(os.path.abspath(__file__))})\n")
        return 127
    os.execv(path, [path] + sys.argv[1:])
