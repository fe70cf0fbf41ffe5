# End-to-end targets; the root Makefile includes this file (`include e2e/e2e.mk`).
.PHONY: e2e e2e-local e2e-unit

## e2e: kind cluster + LocalStack + in-cluster operator (needs docker, kind, kubectl, cargo)
e2e:
	e2e/run-kind.sh $(E2E_ARGS)

## e2e-local: current KUBECONFIG + EC2_ENDPOINT (default: moto on loopback), operator as local processes
e2e-local:
	e2e/run-local.sh $(E2E_ARGS)

## e2e-unit: the suite's own unit tests (agent simulator, checks), no cluster needed
e2e-unit:
	cargo test -p eni-operator-e2e
