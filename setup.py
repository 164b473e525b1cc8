"""Maps the design card's root folders onto the `kinfolk` import namespace, and installs the PEFT startup hook.

`kinfolk/` holds the shared cores, the command line and the test kit; `plugins/`, `trainers/`,
`callbacks/` and `eval_tasks/` sit beside it at the repository root and install as
`kinfolk.plugins`, `kinfolk.trainers`, `kinfolk.callbacks` and `kinfolk.eval_tasks`. Subpackages are
found automatically, so a new component needs no edit here. Everything else lives in pyproject.toml.

PEFT has no plugin entry point for tuner types, so kinfolk puts a `.pth` file at the root of site-packages: `site`
runs its one `import` line at every interpreter start. The line imports `kinfolk` (a few small modules, no torch
or PEFT), which registers ATLAS with PEFT when PEFT is imported. The file goes into the wheel from the build tree
and, for `pip install -e`, straight into the editable wheel, whose build tree is discarded.
"""

from pathlib import Path
from typing import ClassVar

from setuptools import Command, find_packages, setup
from setuptools.command.build import build

NAMESPACE_FOLDERS = {
    "kinfolk": "kinfolk",
    "kinfolk.plugins": "plugins",
    "kinfolk.trainers": "trainers",
    "kinfolk.callbacks": "callbacks",
    "kinfolk.eval_tasks": "eval_tasks",
}

# Sorts after setuptools' `__editable__.*.pth`, which must have made an editable `kinfolk` importable first. A
# missing kinfolk (say, a deleted editable checkout) is passed over in silence rather than reported by every
# Python process of the environment; any other error still shows.
STARTUP_HOOK = "kinfolk-peft-registration.pth"
STARTUP_LINE = (
    'import sys; exec("try:\\n import kinfolk\\nexcept ModuleNotFoundError as error:\\n'
    " if error.name != 'kinfolk': raise\")\n"
)


class build_startup_hook(Command):
    """Write kinfolk's `.pth` startup line where the wheel's site-packages root is assembled."""

    description = "write the .pth line that registers kinfolk's PEFT tuner types at interpreter start"
    user_options: ClassVar[list] = []

    def initialize_options(self):
        self.build_lib = None
        self.editable_mode = False  # set by setuptools' editable_wheel
        self.outputs = []

    def finalize_options(self):
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def run(self):
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        path = Path(root, STARTUP_HOOK)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(STARTUP_LINE, encoding="utf-8")
        self.outputs = [str(path)]

    def get_outputs(self):
        return self.outputs


class build_with_startup_hook(build):
    sub_commands: ClassVar[list] = [*build.sub_commands, ("build_startup_hook", None)]


packages = []
for package, folder in NAMESPACE_FOLDERS.items():
    packages.append(package)
    packages.extend(f"{package}.{sub}" for sub in find_packages(folder))

setup(
    packages=packages,
    package_dir=NAMESPACE_FOLDERS,
    cmdclass={"build": build_with_startup_hook, "build_startup_hook": build_startup_hook},
)
