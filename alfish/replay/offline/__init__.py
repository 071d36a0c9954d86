"""Offline data (DESIGN.md §3.14): datasets of every kind loaded as read-only replay, mixed with online replay."""
