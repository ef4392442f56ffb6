"""examples/plan_deployment.py runs: a plan, the sweep, the plot with matplotlib and the table without."""
import os
import pathlib
import subprocess
import sys

import lazyprefill

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "plan_deployment.py"
ARGS = ["--hw", "h100-sxm,a100-80gb", "--requests", "120", "--target-rate", "10"]


# Where this lazyprefill was imported from, for the example run from another folder.
HOME = str(pathlib.Path(lazyprefill.__file__).resolve().parents[1])


def run(tmp_path, *args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = HOME
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_plans_and_plots(tmp_path):
    p = run(tmp_path, *ARGS, "--out", "ttft.png")
    assert p.returncode == 0, p.stderr
    assert "plan: " in p.stdout and " x h100-sxm with " in p.stdout
    png = tmp_path / "ttft.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_it_prints_the_table(tmp_path):
    # A matplotlib that cannot be imported, ahead of the real one on the path.
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    path = os.pathsep.join([str(fake), HOME])
    p = run(tmp_path, *ARGS, "--out", "ttft.png", env_extra={"PYTHONPATH": path})
    assert p.returncode == 0, p.stderr
    assert "matplotlib is not installed: no plot" in p.stdout and "TTFT p50 ms" in p.stdout
    assert not (tmp_path / "ttft.png").exists()


def test_bad_input_is_one_line_and_a_failure(tmp_path):
    p = run(tmp_path, "--hw", "h999")
    assert p.returncode != 0
    assert p.stderr.strip().startswith("plan_deployment: unknown hardware 'h999'") and p.stderr.count("\n") == 1
