"""Issue 13, input: NaN/inf/out-of-range numbers, size and nesting limits, description
consistency, doctor --check/--skip typos, Xorg option names, doctor's wording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MINIMAL
from tuning_helpers import cli, fresh

SIM = "z8-fury-4x-a6000"


@pytest.mark.parametrize("body,key,reason", [
    ("[all]\npower_limit = nan\n", "all.power_limit", "finite"),
    ("[all]\npower_limit = inf\n", "all.power_limit", "finite"),
    ("[all]\npower_limit = -250\n", "all.power_limit", "positive"),
    ("[all.fan]\nmode = \"curve\"\npoints = [[30, 40], [nan, 90]]\n", "all.fan.points[1][0]", "finite"),
    ("[all.fan]\nmode = \"curve\"\npoints = [[30, 40], [80, 90]]\nhysteresis = -inf\n", "all.fan.hysteresis",
     "finite"),
])
def test_profiles_refuse_nan_inf_and_negative_numbers(capsys, tmp_path: Path, body: str, key: str,
                                                      reason: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(body)
    code, _, err = cli(capsys, "apply", str(p), "--dry-run", "--simulate", SIM)
    assert code == 2 and f"{p}: {key}: " in err and reason in err and "Traceback" not in err, err


@pytest.mark.parametrize("body,key", [
    ("[doctor]\nfan_check_min_celsius = nan\n", "doctor.fan_check_min_celsius"),
    ("[doctor]\nfan_lag_percent = -10\n", "doctor.fan_lag_percent"),
    ("[doctor]\nidle_temperature_warn_celsius = inf\n", "doctor.idle_temperature_warn_celsius"),
    ("[doctor]\nshm_min_gib_per_gpu = -1\n", "doctor.shm_min_gib_per_gpu"),
    ("[daemon]\nprobe_world_sizes = [0, -2]\n", "daemon.probe_world_sizes"),
    ("[daemon]\ninterval_seconds = nan\n", "daemon.interval_seconds"),
    ("[daemon]\nprobe_interval_hours = -1\n", "daemon.probe_interval_hours"),
    ("[machine]\nexpect_gpus = 4\nnvlink_pairs = [[0, 9]]\n", "machine.nvlink_pairs[0]"),
    ("[machine]\npsu_watts = -inf\n", "machine.psu_watts"),
])
def test_configuration_refuses_nan_and_out_of_range_numbers(capsys, tmp_path: Path, body: str, key: str) -> None:
    p = tmp_path / "gpud.toml"
    p.write_text(body)
    code, _, err = cli(capsys, "doctor", "--config", str(p), "--simulate", SIM)
    assert code == 2 and f"{p}: {key}: " in err, err


def test_nvlink_pairs_naming_a_gpu_the_machine_lacks_is_exit_2(capsys, tmp_path: Path) -> None:
    p = tmp_path / "gpud.toml"
    p.write_text("[machine]\nnvlink_pairs = [[0, 9]]\n")
    code, _, err = cli(capsys, "doctor", "--config", str(p), "--simulate", SIM)
    assert code == 2 and "machine.nvlink_pairs[0]: GPU 9 does not exist: this machine has 4 GPU(s)" in err, err


def _desc(tmp_path: Path, extra_machine: str = "", extra_gpu: str = "", tail: str = "") -> Path:
    text = MINIMAL.format(name="box").replace("[machine]\n", "[machine]\n" + extra_machine)
    p = tmp_path / "box.toml"
    p.write_text(text + extra_gpu + tail)
    return p


@pytest.mark.parametrize("machine,gpu,tail,key", [
    ("", "power_limit_watts = nan\n", "", "gpu[0].power_limit_watts"),
    ("", "power_watts = -5\n", "", "gpu[0].power_watts"),
    ("", "temperature_celsius = 120\n", "", "gpu[0].temperature_celsius"),
    ("", "fan_min_percent = 90\nfan_max_percent = 30\n", "", "gpu[0].fan_min_percent"),
    ("", "slowdown_celsius = 99\nshutdown_celsius = 95\n", "", "gpu[0].slowdown_celsius"),
    ("", "temperature_celsius = -60\n", "", "gpu[0].temperature_celsius"),
    ("psu_watts = -2250\n", "", "", "machine.psu_watts"),
    ("memory_gib = 0\n", "", "", "machine.memory_gib"),
    ("", "", '[[fault]]\nkind = "unsupported"\ncall = "nvmlDeviceGetTemprature"\n', "fault[0].call"),
    ("", "", '[[fault]]\nkind = "fan_stuck"\ngpu = 0\nfan = 3\n', "fault[0].fan"),
    ("", "", '[[gpu]]\nmodel = "RTX A6000"\nbus_id = "0000:16:01.0"\nroot_port = "0000:15:01.0"\n',
     "gpu[0].root_port"),  # GPU 1 sits at GPU 0's root port
])
def test_descriptions_refuse_impossible_or_inconsistent_values(capsys, tmp_path: Path, machine: str, gpu: str,
                                                               tail: str, key: str) -> None:
    p = _desc(tmp_path, machine, gpu, tail)
    code, _, err = cli(capsys, "status", "--simulate", str(p))
    assert code == 2 and f": {key}: " in err and "Traceback" not in err, err


def test_files_have_a_size_and_a_nesting_limit(capsys, tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, _, err = cli(capsys, "apply", str(deep), "--dry-run", "--simulate", SIM)
    assert code == 2 and "nested more than 32 deep" in err, err
    big = tmp_path / "big.toml"
    with open(big, "w") as f:
        f.write("# padding\n" * 250_000)
    for argv in (("apply", str(big), "--dry-run", "--simulate", SIM), ("status", "--simulate", str(big)),
                 ("doctor", "--config", str(big), "--simulate", SIM)):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and f"{big}: larger than 1024 KiB" in err, (argv, err)


@pytest.mark.parametrize("argv", [["--check", "pcie.link_widht"], ["--skip", "nvlnk.*"], ["--check", "nope"]])
def test_doctor_check_or_skip_matching_nothing_is_exit_2(capsys, argv: list[str]) -> None:
    code, _, err = cli(capsys, "doctor", *argv, "--simulate", SIM)
    assert code == 2 and f"{argv[0]}: {argv[1]}: matches no check" in err, err


def test_doctor_skip_in_the_configuration_matching_nothing_is_exit_2(capsys, tmp_path: Path) -> None:
    p = tmp_path / "gpud.toml"
    p.write_text('[doctor]\nskip = ["envv.*"]\n')
    code, _, err = cli(capsys, "doctor", "--config", str(p), "--simulate", SIM)
    assert code == 2 and "doctor.skip: envv.*: matches no check" in err, err


@pytest.mark.parametrize("name", ["Base_Mosaic", "base mosaic", "BASEMOSAIC", "Multi_GPU", "S L I"])
def test_sli_option_names_are_compared_as_xorg_compares_them(capsys, tmp_path: Path, name: str) -> None:
    conf = f'Section "Screen"\n    Identifier "Screen0"\n    Option "{name}" "on"\nEndSection\n'
    p = _desc(tmp_path, tail=f"[xorg]\nconf = {json.dumps(conf)}\n")
    code, out, err = cli(capsys, "doctor", "--check", "sli.disabled", "--json", "--simulate", str(p))
    assert code == 1, err
    assert json.loads(out)["checks"][0]["status"] == "fail"


def test_p2p_with_a_lost_gpu_is_not_blamed_on_acs(capsys, state_dir) -> None:
    fresh().simulation.machine.inject("gpu_lost", gpu=1)
    code, out, _ = cli(capsys, "doctor", "--check", "gpu.p2p", "--json", "--simulate", SIM)
    checks = json.loads(out)["checks"]
    assert checks and all("ACS" not in c["remedy"] for c in checks), checks
    assert any("GPU1, which is lost" in c["summary"] for c in checks), checks


def test_a_bridge_partner_off_the_bus_is_not_a_bridge_to_reseat(capsys, tmp_path: Path, state_dir) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text("[machine]\nnvlink_pairs = [[0, 1], [2, 3]]\n")
    fresh().simulation.machine.inject("off_bus", gpu=1)
    code, out, _ = cli(capsys, "doctor", "--check", "nvlink.links", "--json", "--config", str(conf), "--simulate", SIM)
    checks = [c for c in json.loads(out)["checks"] if c["status"] == "fail"]
    assert checks and all("reseat the NVLink bridge" not in c["remedy"] for c in checks), checks
    assert all("off the bus: 0000:38:00.0" in c["summary"] for c in checks), checks


def test_no_remedy_carries_a_literal_n(capsys, tmp_path: Path, state_dir) -> None:
    # Two NUMA nodes (topo.numa) and an ECC mode change pending (config.ecc): both remedies name
    # what to type, not a placeholder.
    p = tmp_path / "two-node.toml"
    p.write_text('[machine]\nname = "two-node"\nsockets = 2\n'
                 '[[gpu]]\nmodel = "RTX A6000"\nbus_id = "0000:17:00.0"\nroot_port = "0000:16:01.0"\n'
                 'ecc_enabled = true\necc_pending_enabled = false\n'
                 '[[gpu]]\nmodel = "RTX A6000"\nbus_id = "0000:b1:00.0"\nroot_port = "0000:b0:01.0"\nnuma_node = 1\n')
    code, out, _ = cli(capsys, "doctor", "--json", "--simulate", str(p))
    checks = [c for c in json.loads(out)["checks"] if c["status"] in ("warn", "fail")]
    remedies = {c["id"]: [] for c in checks}
    for c in checks:
        remedies[c["id"]].append(c["remedy"])
    assert any("--cpunodebind=1 --membind=1" in r for r in remedies.get("topo.numa", [])), remedies
    assert any("nvidia-smi -r -i 0" in r for r in remedies.get("config.ecc", [])), remedies
    for c in checks:
        assert "-i N" not in c["remedy"] and "=N " not in c["remedy"], c


def test_psu_rating_comes_from_smbios_when_the_configuration_does_not_give_it(capsys, state_dir) -> None:
    m = fresh()
    entry = m.host.path("/sys/firmware/dmi/entries/39-0")
    entry.mkdir(parents=True, exist_ok=True)
    raw = bytearray(0x16)
    raw[0], raw[1] = 39, 0x16
    raw[0x0C:0x0E] = (1125).to_bytes(2, "little")
    (entry / "raw").write_bytes(bytes(raw))
    code, out, _ = cli(capsys, "doctor", "--check", "host.psu", "--json", "--simulate", SIM)
    assert "of a 1125 W supply" in json.loads(out)["checks"][0]["summary"], out


@pytest.mark.parametrize("data,message", [
    ({"machine": {"x": 1}}, "gpud.toml: machine.x: unknown key (known: cpu_tdp_watts, expect_gpus, nvlink_pairs, "
                            "psu_watts)"),
    ({"machine": {"expect_gpus": True}}, "gpud.toml: machine.expect_gpus: must be an integer, not True"),
    ({"doctor": {"fan_lag_percent": 0}}, "gpud.toml: doctor.fan_lag_percent: must be 1..100 %, not 0"),
    ({"doctor": {"memlock_min_mib": 1 << 21}},
     "gpud.toml: doctor.memlock_min_mib: must be 0..1048576 MiB, not 2097152"),
    ({"doctor": {"pcie_replay_warn": -1}}, "gpud.toml: doctor.pcie_replay_warn: must be 0..2147483648, not -1"),
    # the machine's rules come before doctor's ranges, doctor's types before both
    ({"doctor": {"fan_lag_percent": 0}, "machine": {"psu_watts": -1}},
     "gpud.toml: machine.psu_watts: must be positive"),
    ({"doctor": {"fan_lag_percent": "x"}, "machine": {"psu_watts": -1}},
     "gpud.toml: doctor.fan_lag_percent: must be an integer, not 'x'"),
    ({"daemon": {"status_processes": "x"}},
     "gpud.toml: daemon.status_processes: must be one of 'protected', 'always', 'never', not 'x'"),
    ({"probe": {"min_efficiency": {"2": 2}}}, "gpud.toml: probe.min_efficiency.2: must be a ratio in (0, 1], not 2"),
])
def test_config_errors_name_file_key_and_reason(data: dict, message: str) -> None:
    from gpud import config as cfg
    from gpud.errors import InvalidInput

    with pytest.raises(InvalidInput) as err:
        cfg.parse(data, "gpud.toml")
    assert str(err.value) == message


def test_config_sections_are_frozen_dataclasses_with_one_declaration_per_key() -> None:
    import dataclasses

    from gpud import config as cfg

    conf = cfg.parse({"doctor": {"fan_lag_percent": 30}, "daemon": {"listen": ":9"}}, "gpud.toml")
    assert conf.doctor.fan_lag_percent == 30 and conf.doctor.memlock_min_mib == 64 and conf.daemon.listen == ":9"
    assert conf.probe.min_efficiency == {"2": 0.85, "4": 0.875, "8": 0.775} and conf.machine.expect_gpus is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.daemon.listen = ":10"  # type: ignore[misc]
    moved = conf.with_daemon(listen=":10", interval_seconds=2.0)
    assert (moved.daemon.listen, moved.daemon.interval_seconds, conf.daemon.listen) == (":10", 2.0, ":9")
    assert moved.doctor is conf.doctor
    for section, cls in (("machine", cfg.MachineSection), ("doctor", cfg.DoctorSection),
                         ("daemon", cfg.DaemonSection), ("probe", cfg.ProbeSection)):
        assert list(cfg.SECTIONS[section]) == [f.name for f in dataclasses.fields(cls)]
    assert cfg.parse({}, "x") == cfg.Config("x")
    assert cfg.Config().doctor.skip is not cfg.Config().doctor.skip  # a list default is not shared
