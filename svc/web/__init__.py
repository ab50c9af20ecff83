"""
What both HTTP surfaces share (the control plane's Klein app and the data
plane's HTTPS surface): the error tree and its one JSON rendering
(L{svc.web.errors}), the request rules (request ids, bearer parsing, JSON
bodies: L{svc.web.rules}) and the treq client for calls to the control
plane (L{svc.web.clients}).
"""
