"""mooncake_proxy: OpenAI-compatible PD proxy with the Conductor scheduler, simulator and trace replay."""
