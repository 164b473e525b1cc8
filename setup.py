"""Maps the design card's root folders onto the `kinfolk` import namespace.

`kinfolk/` holds the shared cores, the command line and the test kit; `plugins/`, `trainers/`,
`callbacks/` and `eval_tasks/` sit beside it at the repository root and install as
`kinfolk.plugins`, `kinfolk.trainers`, `kinfolk.callbacks` and `kinfolk.eval_tasks`. Subpackages are
found automatically, so a new component needs no edit here. Everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

NAMESPACE_FOLDERS = {
    "kinfolk": "kinfolk",
    "kinfolk.plugins": "plugins",
    "kinfolk.trainers": "trainers",
    "kinfolk.callbacks": "callbacks",
    "kinfolk.eval_tasks": "eval_tasks",
}

packages = []
for package, folder in NAMESPACE_FOLDERS.items():
    packages.append(package)
    packages.extend(f"{package}.{sub}" for sub in find_packages(folder))

setup(packages=packages, package_dir=NAMESPACE_FOLDERS)
