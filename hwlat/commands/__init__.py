"""One module per command; COMMANDS is what the `hwlat` group registers."""

from hwlat.commands.advise import advise
from hwlat.commands.bench import bench
from hwlat.commands.db import db, devices
from hwlat.commands.evaluate import evaluate_cmd
from hwlat.commands.predict import predict
from hwlat.commands.profile import profile
from hwlat.commands.quickstart import quickstart

COMMANDS = [quickstart, profile, devices, predict, evaluate_cmd, bench, advise, db]
