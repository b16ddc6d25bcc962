// Package benchplot draws the benchmark's charts (make bench) with
// gonum.org/v1/plot: line charts over message sizes and grouped bar charts
// of ratios. cmd/rmabench uses it; any series added to the benchmark (for
// example compression) goes through the same two calls.
package benchplot

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgeps" // the formats save writes
	_ "gonum.org/v1/plot/vg/vgimg"
	_ "gonum.org/v1/plot/vg/vgpdf"
	_ "gonum.org/v1/plot/vg/vgsvg"
)

// Series is one line of a Chart.
type Series struct {
	Name   string
	X, Y   []float64 // points; on a log axis, values <= 0 are left out
	Dashed bool      // a baseline (raw TCP, memcpy, ...)
	Color  int       // 1 + an index into the palette; 0 = by the series' position
}

// Tick is a labelled position on an axis.
type Tick struct {
	Value float64
	Label string
}

// Chart is a line chart.
type Chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	XTicks                []Tick // replace the default ticks when set (e.g. "8 B", "1 MiB")
	Series                []Series
}

// Size is the default drawing size.
var Size = struct{ W, H vg.Length }{9 * vg.Inch, 5.5 * vg.Inch}

// Save writes the chart to path; the extension picks the format (.svg,
// .png, .pdf). A chart without a drawable point is an error.
func (c Chart) Save(path string) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.Title, c.XLabel, c.YLabel
	leg := plot.NewLegend()
	p.Add(plotter.NewGrid())
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if len(c.XTicks) > 0 {
		ticks := make([]plot.Tick, len(c.XTicks))
		for i, t := range c.XTicks {
			ticks[i] = plot.Tick{Value: t.Value, Label: t.Label}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	drawn := 0
	for i, s := range c.Series {
		var xys plotter.XYs
		for j := range min(len(s.X), len(s.Y)) {
			x, y := s.X[j], s.Y[j]
			if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) ||
				(c.LogX && x <= 0) || (c.LogY && y <= 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("series %s: %w", s.Name, err)
		}
		ci := i
		if s.Color > 0 {
			ci = s.Color - 1
		}
		col := plotutil.Color(ci)
		line.Color, line.Width = col, vg.Points(1.5)
		if s.Dashed {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		}
		points.Color, points.Shape = col, draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		p.Add(line, points)
		leg.Add(s.Name, line, points)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("chart %q: no points to draw", c.Title)
	}
	return save(p, leg, c.names(), path)
}

func (c Chart) names() []string {
	n := make([]string, len(c.Series))
	for i, s := range c.Series {
		n[i] = s.Name
	}
	return n
}

// Bars is a grouped bar chart: one bar per series in every group.
type Bars struct {
	Title, YLabel string
	Groups        []string // x-axis categories
	Series        []BarSeries
	Reference     float64 // a horizontal line (e.g. 1.0 for ratios); 0 = none
}

// BarSeries is one colour of a Bars chart; Values[i] belongs to Groups[i]
// (NaN or a missing value draws no bar).
type BarSeries struct {
	Name   string
	Values []float64
}

// Save writes the bar chart like Chart.Save.
func (b Bars) Save(path string) error {
	p := plot.New()
	p.Title.Text, p.Y.Label.Text = b.Title, b.YLabel
	leg := plot.NewLegend()
	p.Add(plotter.NewGrid())
	n := len(b.Series)
	if n == 0 || len(b.Groups) == 0 {
		return fmt.Errorf("bar chart %q: nothing to draw", b.Title)
	}
	w := vg.Points(math.Max(4, 60/float64(n)))
	for i, s := range b.Series {
		vals := make(plotter.Values, len(b.Groups))
		for j := range vals {
			if j < len(s.Values) && !math.IsNaN(s.Values[j]) && !math.IsInf(s.Values[j], 0) {
				vals[j] = s.Values[j]
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("series %s: %w", s.Name, err)
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(bars)
		leg.Add(s.Name, bars)
	}
	if b.Reference != 0 {
		ref, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: b.Reference}, {X: float64(len(b.Groups)) - 0.5, Y: b.Reference}})
		if err != nil {
			return err
		}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ref)
	}
	p.NominalX(b.Groups...)
	names := make([]string, n)
	for i, s := range b.Series {
		names[i] = s.Name
	}
	return save(p, leg, names, path)
}

// save draws the plot with its legend in a strip on the right, outside the
// data, and writes the file in the format its extension names.
func save(p *plot.Plot, leg plot.Legend, names []string, path string) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	switch format {
	case "svg", "png", "pdf", "eps", "jpg", "jpeg", "tif", "tiff":
	default:
		return fmt.Errorf("%s: unknown image format (use .svg, .png or .pdf)", path)
	}
	cw, err := draw.NewFormattedCanvas(Size.W, Size.H, format)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	dc := draw.New(cw)
	var strip vg.Length
	for _, n := range names {
		strip = max(strip, leg.TextStyle.Width(n))
	}
	strip += leg.ThumbnailWidth + 3*leg.TextStyle.Font.Size
	p.Draw(draw.Crop(dc, 0, -strip, 0, 0))
	leg.Top, leg.Left = true, true
	leg.YOffs = -p.Title.TextStyle.Font.Size * 2 // level with the data area
	leg.Draw(draw.Crop(dc, dc.Max.X-dc.Min.X-strip+leg.TextStyle.Font.Size, 0, 0, 0))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := cw.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
