"""kernels_db: the kernel database (SQLite) that stores device profiles, and its import/export."""

from kernels_db.portable import ExportSummary, ImportSummary, export_device, import_file
from kernels_db.schema import SCHEMA_VERSION
from kernels_db.store import (
    ConfigRow,
    DeviceRow,
    DeviceSummary,
    KernelDB,
    MeasuredConfig,
    ModelMeasurement,
    RunRow,
    default_db_path,
)

__all__ = [
    "SCHEMA_VERSION",
    "ConfigRow",
    "DeviceRow",
    "DeviceSummary",
    "ExportSummary",
    "ImportSummary",
    "KernelDB",
    "MeasuredConfig",
    "ModelMeasurement",
    "RunRow",
    "default_db_path",
    "export_device",
    "import_file",
]
