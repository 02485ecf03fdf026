module github.com/flashdecode/flashdecode/bindings/go

go 1.19
