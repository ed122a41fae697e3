module podcert.local/examples/go

go 1.24.0

require github.com/spiffe/go-spiffe/v2 v2.9.0
