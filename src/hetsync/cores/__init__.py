"""Protocol decision logic without I/O (sans-IO): plain classes that take events and return
decisions. The transport drives them in real runs; tests (and a simulator) drive the very same
classes. Nothing here may import torch.distributed, threading, socket or sleep (a test checks).
"""
