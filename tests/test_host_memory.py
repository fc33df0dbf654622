from provided_code.infra.host_memory import available_memory


def test_available_memory_is_the_smaller_of_memavailable_and_the_containers_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   16000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_memory(meminfo, cgroup) == (16000000 * 1024, "MemAvailable")  # no limit
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1000\n")
    assert available_memory(meminfo, cgroup) == (16000000 * 1024, "MemAvailable")
    # a pod limited to 8 GB that uses 3 GB, 1 GB of it file cache the kernel can drop
    (cgroup / "memory.max").write_text(f"{8 * 2**30}\n")
    (cgroup / "memory.current").write_text(f"{3 * 2**30}\n")
    (cgroup / "memory.stat").write_text(f"anon 123\ninactive_file {2**30}\nactive_file 5\n")
    assert available_memory(meminfo, cgroup) == (6 * 2**30, "the cgroup's limit less its use")
    assert available_memory(tmp_path / "none", tmp_path / "none")[0] is None
