# squat_store_name.py <seconds> -- run by security_spec: picks a free TCP
# port P on 127.0.0.1, binds the store's abstract unix socket name for it
# (@crun-store:127.0.0.1:P, which anyone on the host may bind first), fills
# its backlog with connections nobody accepts, prints P and holds it all.
import socket, sys, time
t = socket.socket()
t.bind(("127.0.0.1", 0))
port = t.getsockname()[1]
t.close()
name = "\0crun-store:127.0.0.1:%d" % port
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind(name)
l.listen(0)
fill = []
for _ in range(4):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.setblocking(False)
    try:
        c.connect(name)
    except BlockingIOError:
        pass
    fill.append(c)
print(port, flush=True)
time.sleep(float(sys.argv[1]))
