"""Captures real diagnostic IPC replies from the CoreCLR 8.0.4 host into decoder fixtures.

Usage: python3 tests/dotnet/capture_ipc_replies.py tracer-decode/src/diagnostic_ipc/fixtures/ipc
Starts coreclr_host.py, sends each request on its own connection, stores each complete reply
(20-byte header + payload) as <name>.bin. Request bytes follow docs/protocol/diagnostic-ipc.md §3.
"""
import os
import socket
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def message(command_set, command_id, payload=b""):
    return b"DOTNET_IPC_V1\0" + struct.pack("<HBBH", 20 + len(payload), command_set, command_id, 0) + payload


def utf16z(text):
    return struct.pack("<I", len(text) + 1) + (text + "\0").encode("utf-16-le")


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def exchange(path, request):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(request)
        header = read_exact(sock, 20)
        (size,) = struct.unpack_from("<H", header, 14)
        return header + read_exact(sock, size - 20), sock.dup()


def main(out_dir):
    host = subprocess.Popen([sys.executable, os.path.join(HERE, "coreclr_host.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = host.stdout.readline().split()
    pid = int(ready[1])
    stat = open(f"/proc/{pid}/stat").read()
    key = stat[stat.rindex(")") + 2:].split()[19]
    tmp = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(tmp, f"dotnet-diagnostic-{pid}-{key}-socket")
    gc_provider = struct.pack("<QI", 1, 4) + utf16z("Microsoft-Windows-DotNETRuntime") + struct.pack("<I", 0)
    ct2 = struct.pack("<IIBI", 16, 1, 0, 1) + gc_provider
    ct3 = struct.pack("<IIBBI", 16, 1, 0, 0, 1) + gc_provider
    captures = {
        "processinfo_8.0.4": message(4, 0x00),
        "processinfo2_8.0.4": message(4, 0x04),
        "processinfo3_8.0.4": message(4, 0x08),
        "disableperfmap_8.0.4": message(4, 0x06),
        "collecttracing3_unknown_command_8.0.4": message(2, 0x04, ct3),
    }
    for name, request in captures.items():
        reply, conn = exchange(path, request)
        conn.close()
        open(os.path.join(out_dir, name + ".bin"), "wb").write(reply)
    reply, stream = exchange(path, message(2, 0x03, ct2))
    open(os.path.join(out_dir, "collecttracing2_session_8.0.4.bin"), "wb").write(reply)
    stop, conn = exchange(path, message(2, 0x01, reply[20:28]))
    conn.close()
    open(os.path.join(out_dir, "stoptracing_8.0.4.bin"), "wb").write(stop)
    stream.close()
    host.stdin.write("exit\n")
    host.stdin.flush()
    host.wait(timeout=30)


if __name__ == "__main__":
    main(sys.argv[1])
