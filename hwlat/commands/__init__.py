"""One module per command; COMMANDS is what the `hwlat` group registers."""

from hwlat.commands.db import db, devices
from hwlat.commands.profile import profile

COMMANDS = [profile, devices, db]
