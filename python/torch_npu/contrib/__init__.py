"""Helpers for moving existing code onto the npu."""
