# neighbour_mesh.py <host> <port> <group prefix> <rank> <size> -- run by
# security_spec as another user: claims `rank`'s place on a mesh port of a job
# without a secret (a forged hello; the group id is the FNV-1a of its name)
# and reports what the acceptor sent it.
import socket, struct, sys
host, port, prefix, rank, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
h = 2166136261
for ch in prefix.encode():
    h = ((h ^ ch) * 16777619) & 0xffffffff
s = socket.create_connection((host, port), timeout=5)
s.sendall(struct.pack("<IIii", 0x4f4c4548, h, rank, size))
greet = b""
try:
    while len(greet) < 40:
        b = s.recv(40 - len(greet))
        if not b: break
        greet += b
except Exception as e:
    print("attacker: greet error", e)
print("attacker: greeting", greet[:8])
if len(greet) < 40 or greet[:8] != b"crunopen":
    print("attacker: refused"); sys.exit(0)
s.sendall(b"\0" * 64)
data = b""
try:
    while len(data) < 4096:
        b = s.recv(4096)
        if not b: break
        data += b
except Exception:
    pass
print("attacker: stole %d bytes of rank 0's collective traffic" % len(data))
floats = [struct.unpack_from("<f", data, i)[0] for i in range(0, len(data) - 3, 4)]
print("attacker: contains -3.5,7.25,-11:", any(floats[i:i+3] == [-3.5, 7.25, -11.0] for i in range(len(floats))))
