# full_backlog_tcp.py <seconds> -- run by security_spec: a TCP listener on
# 127.0.0.1 whose backlog is full (nobody accepts), so the kernel drops the
# SYNs of any further connect; prints its port and holds it.
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(0)
port = l.getsockname()[1]
fill = []
for _ in range(3):
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    fill.append(c)
time.sleep(0.3)  # the handshakes of the fill complete: the queue is full
print(port, flush=True)
time.sleep(float(sys.argv[1]))
