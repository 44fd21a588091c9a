"""Provisioners start, replace and stop role instances."""

from dsi.provision.backoff import RestartBackoff, RestartPolicy

__all__ = ["RestartBackoff", "RestartPolicy"]
