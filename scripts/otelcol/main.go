// cmdare's test build of the OpenTelemetry Collector (scripts/gobuild otelcol): the core's
// collector with its OTLP receiver (HTTP and gRPC) and contrib's file exporter, so the tests
// read back what the agent pushed (tests/integration/test_otel_collector.py). The same
// release of every collector module: core v0.165.0 / v1.71.0, contrib v0.165.1.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory()); err != nil {
		return f, err
	}
	return f, nil
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "cmdare-otelcol", Description: "OpenTelemetry Collector for cmdare's tests", Version: "0.165.0"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()}, DefaultScheme: "file"},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
