"""Tests of emitters/integrations/: the torch, Ray, OpenTelemetry and queueing integrations."""
