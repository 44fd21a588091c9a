"""Maps the top-level folders onto subpackages of dsi (see ARCHITECTURE: repository layout)."""

from setuptools import find_packages, setup

FOLDERS = {
    "dsi.transport": "transport",
    "dsi.roles": "roles",
    "dsi.kvcache": "kvcache",
    "dsi.kernels": "kernels",
}


def _packages() -> list[str]:
    names = ["dsi", *(f"dsi.{sub}" for sub in find_packages("dsi"))]
    for package, folder in FOLDERS.items():
        names += [package, *(f"{package}.{sub}" for sub in find_packages(folder))]
    return names


# The C kernels travel as source: dsi.kernels.native compiles them on first use.
setup(
    packages=_packages(), package_dir={"dsi": "dsi", **FOLDERS}, package_data={"dsi.kernels": ["*.c", "*.h"]}
)
