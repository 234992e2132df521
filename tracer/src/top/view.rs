//! The screen (ratatui): the list of processes, one row each, and the detail view of one; and
//! what each key does. Every string a process controls (its name, command line, container id,
//! method and thread names) goes through [`screen_cell`]: escaped, and cut to its column.
use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize as _};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};
use tracer_decode::text::screen_cell;

use super::hot::HOT_WINDOW;
use super::model::{Counter, History, Model, ProcessRow, SessionState, SortKey};
use super::procstat::{Threads, state_name};

/// What a value the runtime does not report shows as.
pub const NOT_REPORTED: &str = "n/a";
/// Methods the detail view lists.
pub const DETAIL_METHODS: usize = 10;

/// What the user has asked for.
#[derive(Debug, Default)]
pub struct Ui {
    pub sort: SortKey,
    pub filter: String,
    /// `/` was pressed: keys edit the filter until Enter or Esc.
    pub editing_filter: bool,
    /// The selected process: the first row until the user moves the selection, then the
    /// process picked, wherever sorting takes it.
    pub selected: Option<u32>,
    picked: bool,
    /// The process whose detail is shown.
    pub detail: Option<u32>,
    table: TableState,
}

/// What a key asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    Quit,
}

impl Ui {
    /// Handles a key: sorting (`c` `m` `g` `a` `e`), the filter (`/`), moving (arrows, `j`/`k`,
    /// Page Up/Down, Home/End), the detail (Enter, Esc), quitting (`q`, Ctrl-C).
    pub fn key(&mut self, key: KeyEvent, model: &Model) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::Nothing;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if self.editing_filter {
            match key.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => (self.editing_filter, self.filter) = (false, String::new()),
                KeyCode::Backspace => drop(self.filter.pop()),
                KeyCode::Char(c) if !c.is_control() && self.filter.chars().count() < 64 => {
                    self.filter.push(c);
                }
                _ => return Action::Nothing,
            }
            self.keep_selection_visible(model);
            return Action::Redraw;
        }
        let pids: Vec<u32> =
            model.visible(self.sort, &self.filter).iter().map(|r| r.pid()).collect();
        let at = self.selected.and_then(|pid| pids.iter().position(|&p| p == pid));
        let select = |ui: &mut Ui, index: usize| {
            ui.selected = pids.get(index.min(pids.len().saturating_sub(1))).copied();
            ui.picked = true;
        };
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Esc | KeyCode::Backspace | KeyCode::Left if self.detail.is_some() => {
                self.detail = None;
            }
            KeyCode::Esc if !self.filter.is_empty() => self.filter.clear(),
            KeyCode::Enter | KeyCode::Right if self.detail.is_none() => self.detail = self.selected,
            _ if self.detail.is_some() => return Action::Nothing,
            KeyCode::Char('/') => self.editing_filter = true,
            KeyCode::Down | KeyCode::Char('j') => select(self, at.map_or(0, |i| i + 1)),
            KeyCode::Up | KeyCode::Char('k') => select(self, at.map_or(0, |i| i.saturating_sub(1))),
            KeyCode::PageDown => select(self, at.map_or(0, |i| i + 10)),
            KeyCode::PageUp => select(self, at.map_or(0, |i| i.saturating_sub(10))),
            KeyCode::Home => select(self, 0),
            KeyCode::End => select(self, usize::MAX),
            KeyCode::Char(c) => match SortKey::ALL.iter().find(|k| k.key() == c) {
                Some(&sort) => self.sort = sort,
                None => return Action::Nothing,
            },
            _ => return Action::Nothing,
        }
        Action::Redraw
    }

    /// Selects the first row until the user picks one (and when the one picked is no longer
    /// shown), and leaves the detail of a process that is gone.
    pub fn keep_selection_visible(&mut self, model: &Model) {
        let rows = model.visible(self.sort, &self.filter);
        if !self.picked || !self.selected.is_some_and(|pid| rows.iter().any(|r| r.pid() == pid)) {
            self.selected = rows.first().map(|r| r.pid());
            self.picked = false;
        }
        if self.detail.is_some_and(|pid| !model.contains(pid)) {
            self.detail = None;
        }
    }

    /// Draws the screen: the detail of the process it shows, else the list.
    pub fn draw(&mut self, frame: &mut Frame, model: &Model, threads: &Threads) {
        match self.detail.and_then(|pid| model.by_pid(pid)) {
            Some(row) => draw_detail(frame, row, threads),
            None => self.draw_list(frame, model),
        }
    }

    fn draw_list(&mut self, frame: &mut Frame, model: &Model) {
        let [title, body, help] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(1)])
                .areas(frame.area());
        let rows = model.visible(self.sort, &self.filter);
        let filter = match (&self.filter, self.editing_filter) {
            (f, true) => format!(" · filter: {}_", screen_cell(f, 64)),
            (f, false) if !f.is_empty() => format!(" · filter: {}", screen_cell(f, 64)),
            _ => String::new(),
        };
        let traced = model.rows().filter(|r| r.session == SessionState::Tracing).count();
        let heading = format!(
            "tracer top · {} of {} .NET processes · {traced} sending counters · sorted by {}{filter}",
            rows.len(),
            model.len(),
            self.sort.name(),
        );
        frame.render_widget(Paragraph::new(Line::from(heading).bold()), title);
        let fixed: u16 = COLUMNS.iter().map(|(_, w)| w + 1).sum();
        let method_width = usize::from(body.width.saturating_sub(fixed)).max(10);
        let header = Row::new(
            COLUMNS
                .iter()
                .map(|(name, _)| *name)
                .chain(["HOT METHOD"])
                .enumerate()
                .map(|(i, name)| numeric_cell(name.to_string(), i)),
        )
        .style(Style::new().bold().reversed());
        let table_rows = rows.iter().map(|row| {
            Row::new(
                list_cells(row)
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| numeric_cell(text, i))
                    .chain([Cell::from(hot_cell(row, method_width))]),
            )
        });
        let widths =
            COLUMNS.iter().map(|&(_, w)| Constraint::Length(w)).chain([Constraint::Fill(1)]);
        let table = Table::new(table_rows, widths)
            .header(header)
            .column_spacing(1)
            .row_highlight_style(Style::new().reversed());
        let selected = self.selected.and_then(|pid| rows.iter().position(|r| r.pid() == pid));
        self.table.select(selected);
        frame.render_stateful_widget(table, body, &mut self.table);
        let keys = SortKey::ALL
            .iter()
            .map(|k| match *k == self.sort {
                true => format!("[{}] {}", k.key(), k.name()),
                false => format!("{} {}", k.key(), k.name()),
            })
            .collect::<Vec<_>>()
            .join("  ");
        let help_line = format!("{keys}  / filter  ↑↓ select  Enter detail  q quit");
        frame.render_widget(Paragraph::new(help_line), help);
    }
}

/// The list's columns before the hot method, and their widths.
const COLUMNS: [(&str, u16); 16] = [
    ("PID", 7),
    ("NAME", 16),
    ("CONTAINER", 12),
    ("RUNTIME", 8),
    ("CPU%", 6),
    ("WS", 7),
    ("HEAP", 7),
    ("GC0/s", 5),
    ("GC1/s", 5),
    ("GC2/s", 5),
    ("GC%", 5),
    ("ALLOC/s", 7),
    ("EXC/s", 6),
    ("LOCK/s", 6),
    ("POOL", 5),
    ("QUEUE", 5),
];

/// Columns from `CPU%` on hold numbers: aligned right.
const FIRST_NUMERIC: usize = 4;

fn numeric_cell(text: String, column: usize) -> Cell<'static> {
    match column >= FIRST_NUMERIC && column < COLUMNS.len() {
        true => Cell::from(Line::from(text).right_aligned()),
        false => Cell::from(text),
    }
}

/// The list's cells of `row` before the hot method, each fitted to its column.
pub fn list_cells(row: &ProcessRow) -> Vec<String> {
    let c = |counter| row.counters.get(counter);
    let texts = [
        row.pid().to_string(),
        row.name.clone(),
        place(row),
        version(row.runtime_version.as_deref()),
        percent(row.cpu_percent),
        bytes(row.working_set_bytes.map(|b| b as f64)),
        bytes(c(Counter::GcHeap)),
        rate(c(Counter::Gen0Gcs)),
        rate(c(Counter::Gen1Gcs)),
        rate(c(Counter::Gen2Gcs)),
        percent(c(Counter::GcPaused)),
        bytes(c(Counter::Allocations)),
        rate(c(Counter::Exceptions)),
        rate(c(Counter::LockContentions)),
        rate(c(Counter::PoolThreads)),
        rate(c(Counter::PoolQueue)),
    ];
    texts.iter().zip(COLUMNS).map(|(text, (_, width))| screen_cell(text, width.into())).collect()
}

/// The hot method cell: the method and its share of the process's samples.
fn hot_cell(row: &ProcessRow, width: usize) -> String {
    match row.hot.hottest() {
        Some((name, share)) => {
            let share = format!(" {share:.0}%");
            let name = screen_cell(name, width.saturating_sub(share.len()));
            format!("{name}{share}")
        }
        None if row.hot.samples == 0 => String::new(),
        None => "(no managed frame)".to_string(),
    }
}

/// Where the process runs: its container (12 digits, as docker shows it), else its pod.
fn place(row: &ProcessRow) -> String {
    match (row.container_id(), row.pod_uid()) {
        (Some(id), _) => id.chars().take(12).collect(),
        (None, Some(pod)) => format!("pod {pod}"),
        (None, None) => "-".to_string(),
    }
}

/// The version without its build metadata (`8.0.4+2d7eea…` → `8.0.4`).
fn version(v: Option<&str>) -> String {
    v.map_or_else(|| NOT_REPORTED.to_string(), |v| v.split('+').next().unwrap_or(v).to_owned())
}

pub fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| NOT_REPORTED.to_string(), |v| format!("{v:.1}"))
}

/// A count or rate: one decimal below 10, none above, `k`/`M` beyond five digits.
pub fn rate(v: Option<f64>) -> String {
    match v {
        None => NOT_REPORTED.to_string(),
        Some(v) if v.abs() < 10.0 && v.fract() != 0.0 => format!("{v:.1}"),
        Some(v) if v.abs() < 1e5 => format!("{v:.0}"),
        Some(v) if v.abs() < 1e8 => format!("{:.0}k", v / 1e3),
        Some(v) => format!("{:.0}M", v / 1e6),
    }
}

/// Bytes in binary units: `512B`, `12.3K`, `340.5M`, `2.1G`.
pub fn bytes(v: Option<f64>) -> String {
    let Some(mut v) = v else { return NOT_REPORTED.to_string() };
    for unit in ["B", "K", "M", "G", "T"] {
        if v.abs() < 1024.0 || unit == "T" {
            return match unit {
                "B" => format!("{v:.0}{unit}"),
                _ => format!("{v:.1}{unit}"),
            };
        }
        v /= 1024.0;
    }
    unreachable!("the last unit returns")
}

/// The last `width` values as a sparkline, scaled from 0 to their largest.
pub fn sparkline(history: &History, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let values: Vec<f64> = history.values().collect();
    let shown = &values[values.len().saturating_sub(width)..];
    let max = shown.iter().copied().fold(0.0, f64::max);
    shown
        .iter()
        .map(|&v| match max > 0.0 && v > 0.0 {
            true => BARS[((v / max * 7.0).round() as usize).min(7)],
            false => BARS[0],
        })
        .collect()
}

fn draw_detail(frame: &mut Frame, row: &ProcessRow, threads: &Threads) {
    let [title, command, body, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let width = usize::from(frame.area().width);
    let session = match row.session.detail() {
        Some(detail) => format!("{} ({})", row.session.name(), screen_cell(detail, 60)),
        None => row.session.name().to_string(),
    };
    let heading = format!(
        "pid {} · {} · runtime {} · {} · session {session}",
        row.pid(),
        screen_cell(&row.name, 16),
        screen_cell(&version(row.runtime_version.as_deref()), 16),
        match (row.container_id(), row.pod_uid()) {
            (None, None) => "host".to_string(),
            (container, pod) => format!(
                "container {} pod {}",
                screen_cell(container.unwrap_or("-"), 64),
                screen_cell(pod.unwrap_or("-"), 36)
            ),
        },
    );
    frame.render_widget(Paragraph::new(Line::from(screen_cell(&heading, width)).bold()), title);
    let command_line = format!("command: {}", row.command_line.as_deref().unwrap_or(NOT_REPORTED));
    frame.render_widget(Paragraph::new(screen_cell(&command_line, width)), command);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(body);
    draw_counters(frame, row, left);
    let [methods, thread_list] =
        Layout::vertical([Constraint::Length(DETAIL_METHODS as u16 + 3), Constraint::Min(0)])
            .areas(right);
    draw_methods(frame, row, methods);
    draw_threads(frame, threads, thread_list);
    frame.render_widget(Paragraph::new("Esc back  q quit"), help);
}

fn draw_counters(frame: &mut Frame, row: &ProcessRow, area: Rect) {
    let c = |counter| row.counters.get(counter);
    let h = |counter| row.counters.history(counter);
    let lines: [(&str, String, &History); 12] = [
        ("CPU %", percent(row.cpu_percent), &row.cpu_history),
        ("working set", bytes(row.working_set_bytes.map(|b| b as f64)), &row.working_set_history),
        ("GC heap", bytes(c(Counter::GcHeap)), h(Counter::GcHeap)),
        ("gen 0 GCs/s", rate(c(Counter::Gen0Gcs)), h(Counter::Gen0Gcs)),
        ("gen 1 GCs/s", rate(c(Counter::Gen1Gcs)), h(Counter::Gen1Gcs)),
        ("gen 2 GCs/s", rate(c(Counter::Gen2Gcs)), h(Counter::Gen2Gcs)),
        ("GC paused %", percent(c(Counter::GcPaused)), h(Counter::GcPaused)),
        ("allocated/s", bytes(c(Counter::Allocations)), h(Counter::Allocations)),
        ("exceptions/s", rate(c(Counter::Exceptions)), h(Counter::Exceptions)),
        ("lock contentions/s", rate(c(Counter::LockContentions)), h(Counter::LockContentions)),
        ("thread-pool threads", rate(c(Counter::PoolThreads)), h(Counter::PoolThreads)),
        ("thread-pool queue", rate(c(Counter::PoolQueue)), h(Counter::PoolQueue)),
    ];
    let spark_width = usize::from(area.width.saturating_sub(2 + 19 + 1 + 8 + 1));
    let rows = lines.iter().map(|(name, now, history)| {
        Row::new([
            Cell::from(*name),
            Cell::from(Line::from(now.clone()).right_aligned()),
            Cell::from(sparkline(history, spark_width)),
        ])
    });
    let widths = [Constraint::Length(19), Constraint::Length(8), Constraint::Fill(1)];
    let table = Table::new(rows, widths)
        .column_spacing(1)
        .block(Block::bordered().title(" counters (last 60 s) "));
    frame.render_widget(table, area);
}

fn draw_methods(frame: &mut Frame, row: &ProcessRow, area: Rect) {
    let name_width = usize::from(area.width.saturating_sub(2 + 6 + 1));
    let samples = row.hot.samples.max(1);
    let rows = row.hot.methods.iter().take(DETAIL_METHODS).map(|(name, n)| {
        let share = f64::from(*n) * 100.0 / f64::from(samples);
        Row::new([
            Cell::from(Line::from(format!("{share:.0}%")).right_aligned()),
            Cell::from(screen_cell(name, name_width)),
        ])
    });
    let title = format!(
        " top methods on CPU (last {} s, {} samples) ",
        HOT_WINDOW.as_secs(),
        row.hot.samples
    );
    let table = Table::new(rows, [Constraint::Length(5), Constraint::Fill(1)])
        .column_spacing(1)
        .block(Block::bordered().title(title));
    frame.render_widget(table, area);
}

fn draw_threads(frame: &mut Frame, threads: &Threads, area: Rect) {
    let name_width = usize::from(area.width.saturating_sub(2 + 8 + 10 + 6 + 3));
    let header = Row::new(["TID", "STATE", "CPU%", "NAME"]).style(Style::new().bold());
    let rows = threads.rows.iter().map(|t| {
        Row::new([
            Cell::from(t.tid.to_string()),
            Cell::from(state_name(t.state)),
            Cell::from(Line::from(percent(t.cpu_percent)).right_aligned()),
            Cell::from(screen_cell(&t.name, name_width)),
        ])
    });
    let more = match threads.not_shown {
        0 => String::new(),
        n => format!(", {n} more not shown"),
    };
    let title = format!(" threads ({}{more}) ", threads.rows.len());
    let widths =
        [Constraint::Length(8), Constraint::Length(10), Constraint::Length(6), Constraint::Fill(1)];
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .block(Block::bordered().title(title));
    frame.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEvent;

    use super::*;
    use crate::output::Incarnation;
    use crate::top::model::HotMethods;

    fn row(pid: u32, name: &str, cpu: f64) -> ProcessRow {
        let mut row = ProcessRow::new(Incarnation::new(pid, Some(1)), name.into(), None);
        row.cpu_percent = Some(cpu);
        row
    }

    fn screen(ui: &mut Ui, model: &Model, width: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, 8)).unwrap();
        terminal.draw(|frame| ui.draw(frame, model, &Threads::default())).unwrap();
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| (0..buffer.area.width).map(|x| buffer[(x, y)].symbol()).collect())
            .collect()
    }

    #[test]
    fn numbers_show_their_units_and_unreported_values_say_so() {
        assert_eq!(bytes(None), "n/a");
        assert_eq!(bytes(Some(512.0)), "512B");
        assert_eq!(bytes(Some(1.5 * 1024.0 * 1024.0)), "1.5M");
        assert_eq!(rate(Some(0.0)), "0");
        assert_eq!(rate(Some(2.5)), "2.5");
        assert_eq!(rate(Some(1234.4)), "1234");
        assert_eq!(rate(Some(250_000.0)), "250k");
        assert_eq!(percent(Some(99.44)), "99.4");
        assert_eq!(version(Some("8.0.4+2d7eea25")), "8.0.4");
    }

    #[test]
    fn hostile_names_are_escaped_and_keep_their_column() {
        let mut model = Model::default();
        model.insert(row(41, "\u{1b}[2J\u{1b}[31mevil\nname", 50.0));
        model.insert(row(42, "plain", 10.0));
        let mut hostile = HotMethods { samples: 10, ..Default::default() };
        hostile.methods.push(("\u{1b}]0;owned\u{7}Spin\n".into(), 10));
        model.get_mut(Incarnation::new(41, Some(1))).unwrap().hot = hostile;
        let mut ui = Ui::default();
        let lines = screen(&mut ui, &model, 180);
        let (evil, plain) = (&lines[2], &lines[3]);
        assert!(evil.starts_with("41 ") && plain.starts_with("42 "), "{lines:#?}");
        assert!(evil.contains("\\u{1b}[2J\\u{1b}…"), "{evil}");
        assert!(evil.contains("\\u{1b}]0;owned\\u{7}Spin\\n 100%"), "{evil}");
        // The CPU column ends where the header's does on both rows (in columns: the cut name
        // holds a character of three bytes).
        let column = |line: &str, at: usize| line.chars().skip(at).take(4).collect::<String>();
        let cpu =
            lines[1].chars().collect::<Vec<_>>().windows(4).position(|w| w == ['C', 'P', 'U', '%']);
        let cpu = cpu.expect("a CPU% column");
        assert_eq!(column(evil, cpu), "50.0", "{evil}");
        assert_eq!(column(plain, cpu), "10.0", "{plain}");
        assert!(lines.iter().all(|l| !l.chars().any(char::is_control)));
    }

    #[test]
    fn keys_sort_filter_select_and_quit() {
        let mut model = Model::default();
        model.insert(row(1, "api", 5.0));
        model.insert(row(2, "batch", 50.0));
        let mut ui = Ui::default();
        ui.keep_selection_visible(&model);
        assert_eq!(ui.selected, Some(2), "the busiest first");
        let press = |ui: &mut Ui, code| ui.key(KeyEvent::from(code), &model);
        assert_eq!(press(&mut ui, KeyCode::Down), Action::Redraw);
        assert_eq!(ui.selected, Some(1));
        assert_eq!(press(&mut ui, KeyCode::Enter), Action::Redraw);
        assert_eq!(ui.detail, Some(1));
        assert_eq!(press(&mut ui, KeyCode::Char('m')), Action::Nothing, "no sorting in the detail");
        assert_eq!(press(&mut ui, KeyCode::Esc), Action::Redraw);
        assert_eq!(ui.detail, None);
        press(&mut ui, KeyCode::Char('m'));
        assert_eq!(ui.sort, SortKey::Memory);
        press(&mut ui, KeyCode::Char('/'));
        for c in "BAT".chars() {
            press(&mut ui, KeyCode::Char(c));
        }
        press(&mut ui, KeyCode::Enter);
        assert_eq!((ui.filter.as_str(), ui.editing_filter, ui.selected), ("BAT", false, Some(2)));
        assert_eq!(press(&mut ui, KeyCode::Char('q')), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(ui.key(ctrl_c, &model), Action::Quit);
    }
}
