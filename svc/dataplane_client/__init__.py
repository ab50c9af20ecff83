"""
The data-plane client: what a mount (or any other client) needs to talk to a
data-plane server, and nothing of the server.

L{svc.dataplane_client.client} (connect, wait for admission, pipelined
calls), L{svc.dataplane_client.errors} (what a failed call means: resend,
check, re-enroll, or the server's errno) and
L{svc.dataplane_client.reconnecting} (a caller that outlives its
connections). The frames and operations are L{svc.wire}'s.
"""
