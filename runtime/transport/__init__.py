"""Transport between the conductor and the workers: typed messages and ZeroMQ queues.

`messages` defines every control message (msgspec Structs, msgpack on the wire);
`frames` turns tensors into raw buffer frames and back (zero-copy on receive);
`queues` hides ZeroMQ behind small typed queue classes. Nothing here pickles.
"""
