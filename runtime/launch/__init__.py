"""Start a served mstar as real processes and wait until it answers: for tests, benchmarks and tools.

`server` runs one `mstar-run` on a port it binds itself (`Server`, `compile_plan`, `http`);
`netns` makes several hosts on one machine from Linux network namespaces (`Network`);
`cluster` serves a plan across those hosts, each remote rank a `mstar-run worker` (`Cluster`, `keygen`);
`browser` is the headless Chromium that opens the server's page.
The serving runtime itself never imports this package.
"""
