"""Starting workers: spawned on this machine by hetsync, or under torchrun on several."""
