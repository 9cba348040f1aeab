"""The persistent XLA compilation cache: where it lives and how it is turned off (cli/compile_cache.py)."""

from jepa_cli.cli.compile_cache import (CACHE_MAX_BYTES, compilation_cache_dir, compilation_cache_off_reason,
                                        use_compilation_cache)


def test_cache_defaults_to_xdg_cache_home():
    assert compilation_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/jepa/xla"


def test_cache_falls_back_to_dot_cache_in_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    assert compilation_cache_dir({}) == "/home/u/.cache/jepa/xla"


def test_jepa_cache_dir_names_the_folder():
    assert compilation_cache_dir({"JEPA_CACHE_DIR": "/scratch/xla", "XDG_CACHE_HOME": "/c"}) == "/scratch/xla"


def test_jepa_cache_dir_off_disables_the_cache():
    for off in ("off", "0", "", "none", "FALSE"):
        env = {"JEPA_CACHE_DIR": off}
        use_compilation_cache(env)
        assert env == {"JEPA_CACHE_DIR": off}


def test_cache_is_handed_to_jax_with_a_size_cap_and_a_users_own_setting_wins():
    env = {"JEPA_CACHE_DIR": "/x"}
    use_compilation_cache(env)
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/x"
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(CACHE_MAX_BYTES) == str(2 << 30)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.05"  # a step's helpers, not one-op programs
    mine = {"JEPA_CACHE_DIR": "/x", "JAX_COMPILATION_CACHE_DIR": "/mine"}
    use_compilation_cache(mine)
    assert mine["JAX_COMPILATION_CACHE_DIR"] == "/mine"


def test_no_cache_when_one_process_simulates_several_cpu_devices():
    # a step's all-reduces loaded from the cache deadlocked now and then (compilation_cache_dir)
    assert compilation_cache_dir({"JEPA_CACHE_DIR": "/x", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}) is None
    assert compilation_cache_dir({"JEPA_CACHE_DIR": "/x", "JAX_NUM_CPU_DEVICES": "4"}) is None
    assert compilation_cache_dir({"JEPA_CACHE_DIR": "/x", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}) == "/x"
    env = {"JEPA_CACHE_DIR": "/x", "XLA_FLAGS": "--xla_dump_to=/d --xla_force_host_platform_device_count=2"}
    use_compilation_cache(env)
    assert "JAX_COMPILATION_CACHE_DIR" not in env


def test_the_reason_for_no_cache_names_the_variable_that_turned_it_off():
    assert compilation_cache_off_reason({"JEPA_CACHE_DIR": "off"}) == "JEPA_CACHE_DIR='off'"
    assert compilation_cache_off_reason({"JEPA_CACHE_DIR": "/scratch/xla"}) is None
