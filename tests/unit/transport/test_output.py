"""transport/output.py: a process's output and its children's go to the file."""

import subprocess
import sys
import textwrap


def test_output_and_childrens_output_go_to_the_file(tmp_path):
    log = tmp_path / "logs" / "actor-0.log"
    code = textwrap.dedent(f"""
        import subprocess, sys
        from transport.output import redirect_output
        print("before", flush=True)
        redirect_output({str(log)!r})
        print("mine", flush=True)
        print("my error", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", "print('child')"], check=True)
        assert redirect_output(None) is None
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before\n" and proc.stderr == ""
    assert log.read_text().split() == ["mine", "my", "error", "child"]
