"""Outbound notifications: endpoints the admin configures, and each delivery to them with every try it took."""
