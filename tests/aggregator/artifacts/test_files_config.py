"""`[[files]]` as `evagg check-config` reads it: every problem named by its key, and the
tables that would ship nothing said as warnings (docs/configuration.md, "Files")."""

from __future__ import annotations

from pathlib import Path

from tests.aggregator.cli.newcomer import evagg
from tests.ports import free_port


def config(tmp_path: Path, files: str, sinks: str | None = None) -> Path:
    if sinks is None:
        sinks = f'[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "{tmp_path}/lake"\n'
    path = tmp_path / "evagg.toml"
    path.write_text(f'[agent]\nsocket = "{tmp_path}/events.sock"\nstate_dir = "{tmp_path}/s"\n'
                    f'http_listen = "127.0.0.1:{free_port()}"\n\n{sinks}\n{files}')
    return path


def test_a_good_files_table_is_ok(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    path = config(tmp_path, f'[[files]]\npath = "{tmp_path}/traces"\nkind = "torch_trace"\n'
                            'run_id = "exp-42"\nsettle = "10s"\n')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "config OK" in checked.stdout and "files" not in checked.stderr


def test_every_problem_of_the_files_tables_is_named(tmp_path: Path) -> None:
    path = config(tmp_path, '[[files]]\npath = "traces"\nsettle = "0s"\npatern = "*"\n\n'
                            f'[[files]]\npath = "{tmp_path}/a"\nkind = "x"\n\n'
                            f'[[files]]\npath = "{tmp_path}/a/b"\nkind = "y"\n')
    checked = evagg("check-config", "--config", str(path))
    assert checked.returncode == 2
    err = checked.stderr
    assert "files[0].path: give the absolute path of the directory to watch" in err
    assert "files[0].kind: say what the files are: torch_trace, nccl_flight_recorder" in err
    assert "files[0].settle: '0s' must be longer than zero" in err
    assert "files[0].patern: unknown key" in err
    assert f"files: {tmp_path}/a and {tmp_path}/a/b overlap" in err


def test_files_that_would_ship_nothing_are_warnings(tmp_path: Path) -> None:
    table = f'[[files]]\npath = "{tmp_path}/later"\nkind = "nccl_flight_recorder"\n'
    missing = evagg("check-config", "--config", str(config(tmp_path, table)))
    assert missing.returncode == 0, missing.stderr
    assert (f"config warning: files[0].path: {tmp_path}/later does not exist yet; its files "
            "are shipped once it does") in missing.stderr
    http = '[[sinks]]\nname = "c"\ntype = "http"\nurl = "http://127.0.0.1:9/x"\n'
    unkept = evagg("check-config", "--config", str(config(tmp_path, table, sinks=http)))
    assert unkept.returncode == 0, unkept.stderr
    assert "files: no Parquet sink to keep the watched files in" in unkept.stderr
