# SPDX-License-Identifier: MIT
"""Prints the directory a pure Python package installed under prefix argv[1] must go to for
this interpreter to import it (used by meson.build)."""
import sys
import sysconfig

prefix = sys.argv[1]
if sysconfig.get_default_scheme() == "posix_local" and prefix == "/usr/local":
    # Debian: base /usr under the posix_local scheme is /usr/local/lib/python3.X/dist-packages
    print(sysconfig.get_paths(vars={"base": "/usr", "platbase": "/usr"})["purelib"])
else:
    print(sysconfig.get_paths(scheme="posix_prefix",
                              vars={"base": prefix, "platbase": prefix})["purelib"])
