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


# Folders of files only, installed as dsi/configs and dsi/requirements: what the benchmarks and
# `dsi sim` read from a wheel (dsi.paths finds them there, or in the checkout).
DATA_FOLDERS = {"dsi.configs": "configs", "dsi.requirements": "requirements"}

# The C kernels travel as source: dsi.kernels.native compiles them on first use. The gateway's
# dashboard page is a file beside its module.
PACKAGE_DATA = {
    "dsi.kernels": ["*.c", "*.h"],
    "dsi.roles.entrypoint.dashboard": ["*.html"],
    "dsi.configs": ["*.toml"],
    "dsi.requirements": ["vllm.lock"],
}

setup(
    packages=[*_packages(), *DATA_FOLDERS],
    package_dir={"dsi": "dsi", **FOLDERS, **DATA_FOLDERS},
    package_data=PACKAGE_DATA,
)
