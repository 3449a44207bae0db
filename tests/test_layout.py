"""The repository's layout guards: `platform/` is a source root, never a package."""

import platform
import subprocess
import sys

from conftest import REPO


def test_no_platform_package_shadows_the_stdlib():
    assert not (REPO / "platform" / "__init__.py").exists()
    assert (REPO / "platform" / "scaleforge" / "__init__.py").is_file()


def test_stdlib_platform_in_the_test_process():
    assert platform.system() == "Linux"
    assert "site-packages" not in platform.__file__ and "/platform/" not in platform.__file__


def test_stdlib_platform_and_ray_import_from_the_repo_root():
    code = "import platform, ray, scaleforge, jobs.train; print(platform.system(), platform.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    system, path = out.stdout.split()
    assert system == "Linux"
    assert not path.startswith(str(REPO))
