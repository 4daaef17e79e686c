"""The router's PD-mode command line as the test launcher builds it: one prefill server, one or several decode
servers (a `--decode` each), and more flags."""

from sglang_evs.testing.router import pd_router_command


def flag_values(command: list[str], flag: str) -> list[list[str]]:
    """What follows each occurrence of `flag`, up to the next flag."""
    out = []
    for i, arg in enumerate(command):
        if arg == flag:
            values = []
            for value in command[i + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
            out.append(values)
    return out


def test_one_decode_server_as_before():
    command = pd_router_command("http://p:1", 8998, "http://d:2", 3000)
    assert "--pd-disaggregation" in command
    assert flag_values(command, "--prefill") == [["http://p:1", "8998"]]
    assert flag_values(command, "--decode") == [["http://d:2"]]
    assert flag_values(command, "--port") == [["3000"]]


def test_several_decode_servers_and_more_flags():
    extra = ["--decode-policy", "round_robin", "--health-check-interval-secs", "2"]
    command = pd_router_command("http://p:1", 8998, ["http://d:2", "http://e:3"], 3000, extra)
    assert flag_values(command, "--decode") == [["http://d:2"], ["http://e:3"]]
    assert command[-len(extra) :] == extra
